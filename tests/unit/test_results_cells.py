"""docs/results.md's verdict cells: one sentence each, ours in the unit the paper states its
number in (an accuracy stored as a fraction shown in %, its differences in points), and
the statistics (test, t, p, Holm's family, seeds, notes) folded below the table, the
fields the evaluator may or may not record (test, family, notes as a list) rendered when
present."""

from stalebench.report import results as R
from tests.unit.test_results import verdict


def accuracy_claim(**extra):
    return verdict(
        "toy",
        "one-ends-higher",
        "holds",
        metric="final_accuracy",
        margin=0.01,
        estimate=0.0695,
        ci_low=0.0497,
        ci_high=0.0893,
        p=1.2e-05,
        p_holm=0.0001,
        n=10,
        published="91.41 (4 W) against 84.46 (32 W)",
        sides={"a": "0.9141 ± 0.01 (n=10)", "b": "0.8446 ± 0.02 (n=10)"},
        **extra,
    )


def test_an_accuracy_is_shown_in_the_papers_percent_in_one_sentence():
    cell = R.ours_sentence(accuracy_claim())
    assert cell == (
        "a 91.41 %, b 84.46 %: a − b = 6.95 pp; advantage 6.95 pp (95 % CI 4.97 to 8.93 pp) "
        "against a margin of 1 pp, 10 seeds."
    )
    assert "0.0695" not in cell and cell.count(". ") == 0  # one sentence


def test_times_rates_and_reproduced_gains_keep_their_units():
    time = verdict(
        "toy",
        "sooner",
        "holds",
        metric="time_to_target (test accuracy >= 0.95)",
        margin=1.0,
        estimate=-2.175,
        ci_low=1.425,
        ci_high=2.925,
        sides={"a": "3 ± 0.54 (n=10)", "b": "5.175 ± 1.01 (n=10, 2 never reached)"},
    )
    assert R.ours_sentence(time).startswith("a 3 s, b 5.175 s: a − b = −2.17 s; advantage 2.17 s")
    gain = verdict(
        "toy",
        "gain",
        "does not hold",
        kind="reproduces",
        test="count",
        metric="throughput_updates_per_s",
        scope="a's gain over b",
        ours="… 0 of 2 seeds within it",
        reproduced={"paper": 0.25, "ours": 0.0213, "ratio": 0.085, "tolerance": 1.5},
    )
    assert R.ours_sentence(gain) == (
        "Ours 2.13 % against the paper's 25 %: ours / theirs 0.085, tolerance ×1.5, "
        "0 of 2 seeds within it."
    )
    table = R.published_against_ours([gain]).to_dict("records")[0]
    assert (table["paper"], table["ours"]) == ("25 %", "2.13 %")


def test_the_statistics_are_folded_below_the_table_and_the_cell_links_there():
    family = {"look": 2, "ids": ["one-ends-higher", "other"], "carried": {"other": 0.0}}
    v = accuracy_claim(test="paired t", family=family, notes=["a: seed 3 lost", "b: fine"])
    page = "\n".join(R.section({"name": "toy", "claims": [v]}))
    lines = page.splitlines()
    row = next(x for x in lines if x.startswith("| **one-ends-higher**"))
    assert row.endswith("| **holds** ([statistics](#toy-statistics)) |")
    assert '<a id="toy-statistics"></a>\n<details>' in page and lines[-1] == "</details>"
    stats = next(x for x in lines if x.startswith("- **one-ends-higher**"))
    assert (
        "paired t; t = 7.92 (9 df), p = 1.2e−05 (one-sided), Holm p 0.0001 over 2 claims" in stats
    )
    assert "(one-ends-higher, other) at look 2, 1 carried from earlier looks" in stats
    assert stats.endswith("notes: a: seed 3 lost; b: fine")
    # a record without them (saved before the evaluator wrote them) renders too
    bare = {k: x for k, x in v.items() if k not in ("test", "family", "notes", "sides")}
    assert "- **one-ends-higher**: test unrecorded; " in "\n".join(R.statistics([bare], "toy"))
