"""Small synthetic inputs for the serving simulation's tests (no shared data needed)."""

from __future__ import annotations

from pathlib import Path

HEADER = ("model,hardware,prompt_size,batch_size,token_size,peak_power,average_power,prompt_time,token_time,"
          "e2e_time,tensor_parallel\n")
PROMPTS = (128, 256, 512, 1024, 2048, 4096, 8192)
BATCHES = (1, 2, 4, 8, 16, 32, 64)


def prefill_ms(tokens: float) -> float:
    return 20.0 + 0.05 * tokens + 2e-7 * tokens * tokens


def decode_ms(batch: int, context: float) -> float:
    return 30.0 + 0.2 * batch + 0.002 * batch * batch + 1e-4 * context


def write_profile(path: Path, spike_at: int | None = None,
                  hardware: tuple[str, ...] = ("h100-80gb", "a100-80gb", "h100-80gb-pcap")) -> Path:
    """A profile file shaped like Splitwise's, times from the formulas above (three repetitions of
    each point); `spike_at` makes that batch size's prefill 3x slower at prompt 512 (an outlier)."""
    rows = [HEADER]
    for hw in hardware:
        scale = 1.5 if hw.startswith("a100") else 1.0
        points = [(p, 1, 128) for p in PROMPTS] + [(512, b, 128) for b in BATCHES if b > 1]
        points += [(512, 1, t) for t in (256, 1024, 4096)]
        for prompt, batch, tokens in points:
            pre = prefill_ms(prompt * batch) * scale * (3.0 if batch == spike_at else 1.0)
            dec = decode_ms(batch, batch * (prompt + tokens / 2)) * scale
            for _ in range(3):
                rows.append(f"llama2-70b,{hw},{prompt},{batch},{tokens},0.9,0.6,{pre},{dec},0,8\n")
    path.write_text("".join(rows))
    return path


def write_trace(path: Path, rows: list[tuple[float, int, int]]) -> Path:
    """An Azure-style trace: (seconds after 12:00:00, prompt tokens, output tokens) per request."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens\n"]
    for at, prompt, output in rows:
        minute, sec = divmod(at, 60.0)
        lines.append(f"2023-11-16 12:{int(minute):02d}:{sec:010.7f},{prompt},{output}\n")
    path.write_text("".join(lines))
    return path
