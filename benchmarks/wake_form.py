"""Which form of the host model's wake-up wait predicts unemulated runs it was not fitted
on: a constant, one that grows with the ranks beyond the cores, or one that grows with the
ranks busy when the rank wakes beyond the cores.

    python -m benchmarks.wake_form    # benchmarks/results/wake_form.json, a table printed

`cluster.wake_ms` is fitted by `stalebench calibrate` on a run with one rank more than the
cores. It was first one constant wait (`constant`); docs/fidelity.md showed it missing most
where the most processes share each core (ps on 4 workers: 5 processes on 2 cores). The
second form, chosen after seeing that table, is a wait proportional to the ranks beyond the
cores (`queued`: wake_ms × (ranks − cores), the same as the constant at the probe); for a
run of a given size either form is one wait, so `constant` is the simulator run with
wake_ms / (ranks − cores). This benchmark chose `queued` over `constant`.

The third (`busy`, `cluster.wake_form=busy`), added after the fidelity table at 7f8259f
showed the simulator slowest on the parameter server's BSP (updates/s −17 % on 2 workers,
−21 % on 4), where the workers block while the server handles their gradients and the
server blocks while they compute: a rank that wakes waits wake_ms for each rank busy then
(computing or handling a message), itself included, beyond the cores, none when a core is
idle. It is fitted on the same wake-up probe (`calibrate.fit_wake`, the same real runs).

Judged only on configurations the fidelity table and the calibration never ran: every
family of benchmarks/fidelity.py at 6 workers, and the parameter server's at 3 (4
processes). The rules, each fixed before any run it decides: `queued` replaces the
constant if its median |error| of time to target over these rows is lower than the
constant's; `busy` then replaces `queued` (the default, `cluster.wake_form`) if its median
|error| is lower than `queued`'s. Every form is reported either way. (`queued` stayed the
default until benchmarks/host_form.py chose `sqrt`; this benchmark names it.)
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.fidelity import (  # noqa: E402
    COMMON,
    FAMILIES,
    against,
    calibrated,
    calibration,
    halfway,
    run,
)
from stalebench import calibrate  # noqa: E402
from stalebench.job import environment  # noqa: E402
from tests.conftest import compose  # noqa: E402

HELD_OUT = {"ps": (3, 6), "allreduce": (6,), "local": (6,), "gossip": (6,)}
RESULTS = ROOT / "benchmarks" / "results" / "wake_form.json"
FORMS = ("constant", "queued", "busy")


def main() -> None:
    have, _, probe = calibration(compose(COMMON))
    rows, hosts = [], {}
    for family, arms in FAMILIES.items():
        first = next(iter(arms.values()))
        # the proportional form named (no longer the default): `constant` scales from it
        host = calibrate.probe(compose([*COMMON, *first, "cluster.wake_form=queued"]), probe, have)
        busy_cfg = compose([*COMMON, *first, "cluster.wake_form=busy"])
        busy = {**host, **calibrate.fit_wake(busy_cfg, probe, host, have)}
        hosts[family] = {"queued": host, "busy": busy}
        print(family, "host", hosts[family])
        for n in HELD_OUT[family]:
            ranks = n + (family == "ps")
            for name, arm in arms.items():
                base = [*COMMON, *arm, f"cluster.num_workers={n}"]
                real = run(base)
                target = halfway(real)
                row = {"family": family, "algorithm": name, "workers": n, "ranks": ranks,
                       "target_loss": target, "real": real, "forms": {}}  # fmt: skip
                # the wait each form gives a rank, as the wake_ms the simulator multiplies
                # by the ranks beyond the cores (`busy`: those busy when it wakes)
                scaled = {"constant": 1 / max(ranks - have, 1), "queued": 1, "busy": 1}
                for form, scale in scaled.items():
                    fitted = busy if form == "busy" else host
                    wake = {**fitted, "wake_ms": fitted.get("wake_ms", 0.0) * scale}
                    sim = run([*base, "runtime=sim", *calibrated(probe, wake, have)])
                    row["forms"][form] = {"wake_ms": wake["wake_ms"], **against([real], [sim])}
                rows.append(row)
                print(family, name, n, {f: v["error"] for f, v in row["forms"].items()})
    medians = {
        form: statistics.median(
            abs(r["forms"][form]["error"]) for r in rows if r["forms"][form]["error"] is not None
        )
        for form in FORMS
    }
    chosen = "queued" if medians["queued"] < medians["constant"] else "constant"
    if chosen == "queued" and medians["busy"] < medians["queued"]:
        chosen = "busy"
    result = {
        "cores": have,
        "environment": environment(),  # the CPU, torch's build, the packages' versions
        "probe": probe,
        "hosts": hosts,
        "rows": rows,
        "median_abs_error": medians,
        "chosen": chosen,
        "written": time.strftime("%Y-%m-%d %H:%M"),
    }
    RESULTS.write_text(json.dumps(result, indent=1, default=str))
    print(table(result))


def table(result: dict) -> str:
    pct = lambda x: "—" if x is None else f"{x:+.0%}"  # noqa: E731
    lines = [
        "| family | algorithm | workers (processes) | time to target: real | "
        + " | ".join(FORMS)
        + " | updates/s error: "
        + " | ".join(FORMS)
        + " |",
        "|---|---|---|---|" + "---|" * 2 * len(FORMS),
    ]
    for r in result["rows"]:
        forms = [r["forms"][f] for f in FORMS]
        real = forms[0]["time_to_target"]["real"]
        lines.append(
            f"| {r['family']} | {r['algorithm']} | {r['workers']} ({r['ranks']}) "
            f"| {'—' if real is None else f'{real:.2f} s'} | "
            + " | ".join(pct(f["error"]) for f in forms)
            + " | "
            + " | ".join(pct(f["updates_per_s_error"]) for f in forms)
            + " |"
        )
    m = result["median_abs_error"]
    lines.append(
        "\nMedian |error| of time to target: "
        + ", ".join(f"{f} {m[f]:.0%}" for f in FORMS)
        + f"; chosen by the rules: {result['chosen']}."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
