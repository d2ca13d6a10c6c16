// Amounts and quantities as the CLI prints them (gpupool/money.py and `gpupool usage`): money with the
// currency's minor unit, or more decimals where that would leave a small amount under two significant
// digits; device-hours with 3 decimals, memory GiB-hours with 1. Never rounded to significant digits,
// which would round away whole units of a large amount (12345.67 is not 12350).

const ZERO_DECIMALS = new Set(["BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX",
  "UYI", "VND", "VUV", "XAF", "XOF", "XPF"]);
const THREE_DECIMALS = new Set(["BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"]);
const EXTRA_DECIMALS = 4;

/** Decimals of the currency's minor unit (ISO 4217); 2 for a currency not listed or unknown. */
export function minorDigits(currency) {
  const code = String(currency ?? "").trim().toUpperCase();
  return ZERO_DECIMALS.has(code) ? 0 : THREE_DECIMALS.has(code) ? 3 : 2;
}

/** `v` with `digits` decimals, rounded as Python's format rounds (the exact binary value, a tie to the
 * even digit); toFixed would take a tie away from zero (0.125 -> "0.13", where the CLI shows 0.12). */
export function fixed(v, digits) {
  const text = v.toFixed(digits);
  if (!Number.isFinite(v) || Math.abs(v) >= 1e21) return text;
  const exact = Math.abs(v).toFixed(100); // a double's whole binary value, to the last digit that matters
  const point = exact.indexOf(".");
  const kept = exact.slice(0, point + (digits ? digits + 1 : 0));
  if (!/^50*$/.test(exact.slice(point + 1 + digits))) return text; // not a tie: toFixed agrees
  const last = kept.replace(".", "").slice(-1);
  if (Number(last) % 2 === 1) return text; // rounding up makes it even
  return (v < 0 ? "-" : "") + kept;
}

/** As gpupool.money.money: 1.5 USD -> "1.50", 0.005 USD -> "0.005", 1500 JPY -> "1500", 1.2 BHD -> "1.200". */
export function money(v, currency) {
  const least = minorDigits(currency);
  let digits = least;
  while (digits < least + EXTRA_DECIMALS && Math.abs(v) < Number(`1e${1 - digits}`)) digits += 1;
  let text = fixed(v, digits);
  if (text.includes(".")) {
    const [whole, fraction] = text.split(".");
    const kept = fraction.replace(/0+$/, "").padEnd(least, "0");
    text = kept ? `${whole}.${kept}` : whole;
  }
  return text.startsWith("-") && !/[1-9]/.test(text) ? text.slice(1) : text; // never "-0.00"
}

/** Device-hours as `gpupool usage` prints them: 3 decimals. */
export const deviceHours = (v) => fixed(v, 3);

/** Memory GiB-hours as `gpupool usage` prints them: 1 decimal. */
export const gibHours = (v) => fixed(v, 1);
