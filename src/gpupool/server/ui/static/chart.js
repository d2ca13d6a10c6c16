// A small SVG line chart (no library): series of [time_s, value] on a shared time axis.

const NS = "http://www.w3.org/2000/svg";
const W = 640;
const H = 180;
const PAD = 32;

function el(tag, attrs) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

export function lineChart(series, yMax, label, unit = "devices") {
  const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": label });
  const title = el("title", {});
  title.textContent = label;
  svg.appendChild(title);
  const times = series.flatMap((s) => s.values.map((v) => v[0]));
  const t0 = Math.min(...times);
  const t1 = Math.max(...times, t0 + 1);
  const x = (t) => PAD + ((t - t0) / (t1 - t0)) * (W - 2 * PAD);
  const y = (v) => H - PAD + 8 - (v / yMax) * (H - PAD - 8);
  svg.appendChild(el("line", { x1: PAD, y1: y(0), x2: W - PAD, y2: y(0), class: "axis" }));
  svg.appendChild(el("line", { x1: PAD, y1: y(yMax), x2: W - PAD, y2: y(yMax), class: "grid" }));
  const top = el("text", { x: 2, y: y(yMax) + 4, class: "tick" });
  top.textContent = String(Math.round(yMax * 100) / 100);
  svg.appendChild(top);
  const bottom = el("text", { x: 2, y: y(0) + 4, class: "tick" });
  bottom.textContent = "0";
  svg.appendChild(bottom);
  for (const s of [...series.slice(1), series[0]]) { // the total last, on top
    if (!s || !s.values.length) continue;
    const points = s.values.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    // a series of one point (the first minute of history) is drawn as a dot: a line needs two
    const line = s.values.length > 1 ? el("polyline", { points, class: "line " + s.cls })
      : el("circle", { cx: x(s.values[0][0]).toFixed(1), cy: y(s.values[0][1]).toFixed(1), r: 4, class: "dot " + s.cls });
    const tip = el("title", {});
    tip.textContent = `${s.name}: ${s.values[s.values.length - 1][1]}${unit ? " " + unit : ""} now`;
    line.appendChild(tip);
    svg.appendChild(line);
  }
  const legend = document.createElement("ul");
  legend.className = "legend";
  for (const s of series) {
    const li = document.createElement("li");
    const sw = document.createElement("span");
    sw.className = "swatch " + s.cls;
    sw.setAttribute("aria-hidden", "true");
    li.append(sw, document.createTextNode(s.name));
    legend.appendChild(li);
  }
  const figure = document.createElement("figure");
  figure.append(svg, legend);
  return figure;
}
