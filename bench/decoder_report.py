"""bench/bench_decoder.py's results (its JSON) summarized and written as markdown: per config, a
row per system (a failed one says why), the roofline, the token agreement with PyTorch eager,
and each goal of issue 45 as met or missed by the figures measured."""

from __future__ import annotations

import statistics

from bench_decoder import step_bytes

GOALS = (  # (what, the system compared with, figure, ratio needed)
    ("decode >= 1.2x llama.cpp F32", "llamacpp", "decode", 1.2),
    ("decode >= 2x PyTorch eager", "eager", "decode", 2.0),
    ("prefill >= 1.0x llama.cpp F32", "llamacpp", "prefill", 1.0),
)
ROOFLINE_GOAL = 0.8
TUNING_GOAL_S = 15 * 60
NAMES = {"schedlang": "schedlang", "eager": "PyTorch eager", "compile": "torch.compile",
         "ortgenai": "onnxruntime-genai", "llamacpp": "llama.cpp F32"}  # fmt: skip


def spread(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def best_bandwidth(results: dict) -> float | None:
    """The better of the bandwidth measured before and after the timings (bytes/s)."""
    measured = [v for v in results["bandwidth"].values() if isinstance(v, (int, float))]
    return max(measured) if measured else None


def agreement(tokens: list[int], reference: list[int]) -> int:
    """How many leading tokens are equal."""
    count = 0
    for mine, theirs in zip(tokens, reference, strict=False):
        if mine != theirs:
            break
        count += 1
    return count


def summarize_config(entry: dict, bandwidth: float | None) -> dict:
    """Per system: its figures over the rounds (spread), or the reason it has none."""
    spec, runs = entry["spec"], entry.get("runs", {})
    steps = spec["steps"]
    eager = {run["round"]: run["tokens"] for run in runs.get("eager", []) if "tokens" in run}
    rows = {}
    for system, system_runs in runs.items():
        good = [run for run in system_runs if "error" not in run]
        errors = [run["error"] for run in system_runs if "error" in run]
        row: dict = {"rounds": len(good), "errors": errors}
        if good:
            row["load_s"] = spread([run["load_s"] for run in good])
            row["warmup_s"] = spread([run["warmup_s"] for run in good])
            row["peak_rss_bytes"] = max(run["peak_rss_bytes"] for run in good)
            row["versions"] = good[0]["versions"]
            row["prefill"] = {
                length: spread([int(length) / run["prefill_s"][length] for run in good])
                for length in map(str, spec["prefill"])
            }
            row["decode"] = {}
            for context in map(str, spec["contexts"]):
                rate = spread([steps / run["decode_s"][context] for run in good])
                read = step_bytes(entry["shape"], int(context) + (steps + 1) / 2)
                fraction = rate["median"] * read / bandwidth if bandwidth else None
                agree = [agreement(run["tokens"][context], eager[run["round"]][context])
                         for run in good if run["round"] in eager]  # fmt: skip
                row["decode"][context] = {"tokens_per_s": rate, "step_bytes": read,
                                          "roofline_fraction": fraction,
                                          "agreement": min(agree) if agree else None,
                                          "tokens": steps + 1}  # fmt: skip
        rows[system] = row
    return rows


def goals(name: str, entry: dict, rows: dict) -> list[str]:
    """Each goal as `met`/`missed` with the figures, or why it cannot be judged."""
    lines = []
    ours = rows.get("schedlang", {})
    for what, other, figure, needed in GOALS:
        theirs = rows.get(other, {})
        if figure not in ours or figure not in theirs:
            lines.append(f"- {what}: not judged (schedlang or {NAMES[other]} has no figure)")
            continue
        for length, mine in ours[figure].items():
            mine_rate = mine["tokens_per_s"] if figure == "decode" else mine
            their_rate = theirs[figure][length]
            their_rate = their_rate["tokens_per_s"] if figure == "decode" else their_rate
            ratio = mine_rate["median"] / their_rate["median"]
            verdict = "met" if ratio >= needed else "missed"
            lines.append(f"- {what} at {length} tokens: {verdict} ({ratio:.2f}x)")
    for context, figures in ours.get("decode", {}).items():
        fraction = figures["roofline_fraction"]
        if fraction is None:
            lines.append(f"- decode at >= 80% of the roofline at {context}: not judged")
            continue
        verdict = "met" if fraction >= ROOFLINE_GOAL else "missed"
        lines.append(f"- decode at >= 80% of the roofline at {context}: {verdict} "
                     f"({fraction:.0%})")  # fmt: skip
    if name == "1.5b":
        tuning = entry.get("tuning")
        if tuning:
            verdict = "met" if tuning["wall_s"] <= TUNING_GOAL_S else "missed"
            lines.append(f"- tuned in <= 15 min: {verdict} ({tuning['wall_s'] / 60:.1f} min)")
        else:
            lines.append("- tuned in <= 15 min: not judged (not tuned in this run)")
    return lines


def _cell(figure: dict | None, digits: int = 1) -> str:
    if not figure:
        return "-"
    return (f"{figure['median']:.{digits}f} ({figure['min']:.{digits}f}.."
            f"{figure['max']:.{digits}f})")  # fmt: skip


def render_config(name: str, entry: dict, rows: dict, bandwidth: float | None) -> list[str]:
    spec, shape = entry["spec"], entry["shape"]
    head = (f"## {name}: {shape['layers']} layers, width {shape['hidden']}, {shape['heads']} "
            f"heads, {shape['kv_heads']} KV heads, intermediate {shape['intermediate']}, "
            f"vocabulary {shape['vocab']}, {'tied' if shape['tied'] else 'untied'} "
            f"({entry['parameters'] / 1e9:.3f} B parameters, {entry['parameters'] * 4 / 1e9:.2f} "
            "GB in fp32)")  # fmt: skip
    prefill = [f"prefill {p} tok/s" for p in spec["prefill"]]
    decode = [f"decode @{c} tok/s" for c in spec["contexts"]]
    columns = ["system", "load s", "warm-up s", *prefill, *decode, "peak RSS GB",
               "tokens = eager", "roofline"]  # fmt: skip
    lines = [head, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for system, row in rows.items():
        if not row["rounds"]:
            why = row["errors"][0] if row["errors"] else "not run"
            lines.append(f"| {NAMES[system]} | failed: {why.replace('|', '/')} |")
            continue
        cells = [NAMES[system], _cell(row["load_s"], 2), _cell(row["warmup_s"], 2)]
        cells += [_cell(row["prefill"][str(p)]) for p in spec["prefill"]]
        decode_rows = [row["decode"][str(c)] for c in spec["contexts"]]
        cells += [_cell(d["tokens_per_s"], 2) for d in decode_rows]
        cells.append(f"{row['peak_rss_bytes'] / 1e9:.2f}")
        cells.append(", ".join("-" if d["agreement"] is None else f"{d['agreement']}/{d['tokens']}"
                               for d in decode_rows))  # fmt: skip
        fractions = [d["roofline_fraction"] for d in decode_rows]
        cells.append(", ".join(_percent(f) for f in fractions))
        if len(row["errors"]):
            cells[0] += f" ({len(row['errors'])} rounds failed: {row['errors'][0]})"
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for context in spec["contexts"]:
        read = step_bytes(shape, context + (spec["steps"] + 1) / 2)
        roof = f"{bandwidth / read:.2f} tokens/s" if bandwidth else "unknown (no bandwidth)"
        lines.append(f"- a decode step at context {context}: reads {_bytes(read)}; "
                     f"roofline {roof}")  # fmt: skip
    tuning = entry.get("tuning")
    if tuning:
        lines.append(f"- schedlang tuning wall time: {tuning['wall_s']:.0f} s "
                     f"(`{' '.join(tuning['command'][2:])}`)")  # fmt: skip
    for system, why in entry.get("unavailable", {}).items():
        lines.append(f"- {NAMES[system]}: unavailable: {why}")
    versions = {
        key: value for row in rows.values() for key, value in row.get("versions", {}).items()
    }
    lines.append("- versions: " + ", ".join(f"{key} {value}" for key, value in versions.items()))
    return [*lines, "", "Goals:", "", *goals(name, entry, rows), ""]


def render(results: dict) -> str:
    machine, settings = results["machine"], results["settings"]
    bandwidth = best_bandwidth(results)
    measured = ", ".join(
        f"{when} {value / 1e9:.1f} GB/s" if isinstance(value, (int, float)) else f"{when} {value}"
        for when, value in results["bandwidth"].items()
    )
    lines = [
        "# Decoder LLMs: schedlang against PyTorch, onnxruntime-genai and llama.cpp",
        "",
        f"Machine: {machine['cpu']} (LLVM host cpu `{machine['llvm_cpu']}`), "
        f"{machine['cores']} cores, {machine['memory_gib']} GiB; load average before "
        f"{_load(machine.get('load_before'))}, after {_load(machine.get('load_after'))}. "
        f"{settings['threads']} threads everywhere; {settings['rounds']} rounds, each figure the "
        f"median (min..max); decode: {settings['steps']} greedy steps after the prompt.",
        "",
        f"Read bandwidth ({settings['bandwidth_mib']} MiB float32 sum, torch, "
        f"{settings['threads']} threads): {measured}.",
        "",
    ]
    for name, entry in results["configs"].items():
        rows = summarize_config(entry, bandwidth)
        lines += render_config(name, entry, rows, bandwidth)
    return "\n".join(lines)


def _load(load: list | None) -> str:
    return "-" if not load else " ".join(f"{value:.2f}" for value in load)


def _bytes(count: float) -> str:
    return f"{count / 1e9:.3f} GB" if count >= 1e8 else f"{count / 1e6:.3f} MB"


def _percent(fraction: float | None) -> str:
    if fraction is None:
        return "-"
    return f"{fraction:.0%}" if fraction >= 0.1 else f"{fraction:.1%}"
