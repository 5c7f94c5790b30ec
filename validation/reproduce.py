"""Reproduce one experiment of docs/method.md section 6 on real data (CPU size) and write its
validation page: docs/validation/<experiment>.md (the command, its wall time, the commit,
the base models' accuracies, the agreement table, the IRI quality, and each finding of
docs/method.md section 7 set against the measurement), with its figures in docs/validation/figures/.

    python validation/reproduce.py a --data-root /tmp/data
    python validation/reproduce.py c --data-root /tmp/data --store runs/store

The data root holds cifar-10-batches-py/ and MNIST/raw/ (../shared/data/materialize.py
makes both). Runs resume: a killed run picks up its finished jobs from the store, and runs
that share a store share their base models (A's clean models serve B, C, D and E). Only
the part of the page between the generated markers is rewritten; the discussion below it
is kept.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from _common import pair_family

from stitchlab.report import iri_quality, iri_transfer, markdown_table

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "a": "a_cifar10_resnet18",
    "a_cross_supervision": "a_cross_supervision",
    "a_cross_supervision_converged": "a_cross_supervision_converged",
    "a_cross_supervision_smooth": "a_cross_supervision_smooth",
    "a_default": "a_default_iris",
    "a_smooth": "a_smooth_iris",
    "a_smooth_3fronts": "a_smooth_3fronts",
    "a_smooth_3fronts_early": "a_smooth_3fronts_early",
    "a_smooth_3fronts_dec5": "a_smooth_3fronts_dec5",
    "a_smooth_backs_dec5": "a_smooth_backs_dec5",
    "a_smooth_backs_dec6": "a_smooth_backs_dec6",
    "a_longer_back": "a_longer_back",
    "b": "b_robust",
    "b_adversarial": "b_robust_adversarial",
    "b_converged": "b_robust_converged",
    "b_smooth": "b_robust_smooth",
    "c": "c_unseen",
    "c_seed": "c_unseen_seed",
    "c_seed_10k": "c_unseen_seed_10k",
    "d": "d_cka",
    "e": "e_sanity",
    "coloured_mnist": "coloured_mnist",
}
#: the experiment of docs/method.md section 6 that each page reproduces (its findings)
FAMILY = {
    "a_cross_supervision": "a",
    "a_cross_supervision_converged": "a",
    "a_cross_supervision_smooth": "a",
    "a_default": "a",
    "a_smooth": "a",
    "a_smooth_3fronts": "a",
    "a_smooth_3fronts_early": "a",
    "a_smooth_3fronts_dec5": "a",
    "a_smooth_backs_dec5": "a",
    "a_smooth_backs_dec6": "a",
    "a_longer_back": "a",
    "b_adversarial": "b",
    "b_converged": "b",
    "b_smooth": "b",
    "c_seed": "c",
    "c_seed_10k": "c",
}
BEGIN, END = "<!-- generated:begin -->", "<!-- generated:end -->"
IRI_OBJECTIVES = ("slm", "dm", "fula")


# ---------------------------------------------------------------------------
# Findings of docs/method.md section 7, each set against the results table


def _mean(t: pd.DataFrame, column: str = "agreement") -> pd.Series:
    return t.groupby(["pair", "protocol", "objective", "point_index"])[column].mean()


def _at(m: pd.Series, pair: str, protocol: str, objective: str) -> pd.Series:
    try:
        return m.loc[(pair, protocol, objective)]
    except KeyError:
        return pd.Series(dtype=float)


def _fmt(s: pd.Series) -> str:
    return " / ".join(f"{v:.1f}" for v in s.to_numpy())


def hard_ceiling(t: pd.DataFrame) -> pd.DataFrame | None:
    """Per (pair, protocol, objective, point_index): the mean hard agreement and the most
    it can be, ``100 - |stitched accuracy - back's accuracy|`` (two classifiers whose
    accuracies differ by ``d`` points disagree on at least ``d`` percent of the images;
    a stitch that reads a marker the back ignores is capped at the back's accuracy).
    None without the accuracy columns."""
    need = {"hard_agreement", "accuracy", "reference_accuracy"}
    if not need <= set(t.columns) or t["reference_accuracy"].isna().all():
        return None
    c = t.assign(ceiling=100 - (t["accuracy"] - t["reference_accuracy"]).abs())
    keys = ["pair", "protocol", "objective", "point_index"]
    return c.groupby(keys)[["hard_agreement", "ceiling"]].mean()


def _per_front(t: pd.DataFrame, column: str) -> pd.DataFrame:
    """``column`` per (family, pair, protocol, objective, point), averaged over stitch
    seeds; a pair's family is :func:`pair_family`'s."""
    keys = ["family", "pair", "protocol", "objective", "point_index", "point"]
    return t.assign(family=t["pair"].map(pair_family)).groupby(keys)[column].mean().reset_index()


def front_families(t: pd.DataFrame, column: str = "agreement") -> pd.DataFrame | None:
    """Pairs that differ only in a trailing front number (``cross-seed``, ``cross-seed2``,
    ``cross-seed3``) as one family: per (family, protocol, objective, point) the number of
    fronts and the mean, sample sd, min and max of ``column`` over them (each front's
    value first averaged over its stitch seeds). None when no family has two fronts."""
    g = _per_front(t, column).groupby(["family", "protocol", "objective", "point_index", "point"])
    out = g[column].agg(fronts="count", mean="mean", sd="std", min="min", max="max")
    out = out.reset_index()
    if out["fronts"].max() < 2:
        return None
    return out.sort_values(["family", "protocol", "objective", "point_index"]).drop(
        columns="point_index"
    )


def family_gap(
    t: pd.DataFrame, high: str = "cross-seed", low: str = "cross-bias", protocol: str = "iris"
) -> pd.DataFrame | None:
    """Per objective and point: the mean of family ``high`` minus the mean of family
    ``low`` (of :func:`front_families`), and the smallest and largest gap over every
    pairing of one ``high`` front with one ``low`` front. Families with a common prefix
    (``back4-cross-seed`` against ``back4-cross-bias``: the same fronts into another back)
    get rows of their own, named in a ``back`` column (the prefix without its dash, or
    ``back`` for the unprefixed pair) where there is more than one prefix."""
    per = _per_front(t, "agreement")
    per = per[per["protocol"] == protocol]
    families = set(per["family"])
    prefixes = sorted((f[: -len(high)] for f in families
                       if f.endswith(high) and f[: -len(high)] + low in families),
                      key=lambda p: (p != "", p))  # the unprefixed pair first  # fmt: skip
    rows = []
    for prefix in prefixes:
        for (o, _, point), one in per.groupby(["objective", "point_index", "point"]):
            hi = one.loc[one["family"] == prefix + high, "agreement"]
            lo = one.loc[one["family"] == prefix + low, "agreement"]
            if hi.empty or lo.empty:
                continue
            row = {"back": prefix.rstrip("-") or "back"} if len(prefixes) > 1 else {}
            rows.append({
                **row, "objective": o, "point": point,
                f"{high} fronts": len(hi), f"{low} fronts": len(lo),
                "gap of the means": hi.mean() - lo.mean(),
                "smallest gap": hi.min() - lo.max(), "largest gap": hi.max() - lo.min(),
            })  # fmt: skip
    return pd.DataFrame(rows) if rows else None


def findings(exp: str, t: pd.DataFrame) -> list[tuple[str, str, str]]:
    """``(finding, measured, verdict)`` rows for the experiment's results table."""
    m = _mean(t)
    pairs = list(dict.fromkeys(t["pair"]))
    objectives = [o for o in ("hlm", "slm", "dm", "fula") if o in set(t["objective"])]
    rows: list[tuple[str, str, str]] = []

    def verdict(ok: bool | None) -> str:
        return "n/a" if ok is None else ("agrees" if ok else "differs")

    ceil = hard_ceiling(t)

    def low_cell(pair: str, o: str, i: int, v: float) -> str:
        text = f"{o} at point {i}: {v:.1f}"
        if ceil is not None and (pair, "standard", o, i) in ceil.index:
            hard, most = ceil.loc[(pair, "standard", o, i)]
            text += f" (hard {hard:.1f} of at most {most:.1f})"
        return text

    def standard_similar(claim_pairs):
        for pair in claim_pairs:
            vals = pd.concat([_at(m, pair, "standard", o) for o in objectives])
            if vals.empty:
                continue
            low = [
                low_cell(pair, o, i, v)
                for o in objectives
                for i, v in _at(m, pair, "standard", o).items()
                if v < 80
            ]
            rows.append((
                f"standard stitching calls {pair} similar (80-98 at every point)",
                f"min {vals.min():.1f}, max {vals.max():.1f}"
                + (f"; below 80: {', '.join(low)}" if low else ""),
                verdict(vals.min() >= 80),
            ))  # fmt: skip

    def iris_curve(pair, claim, ok):
        for o in IRI_OBJECTIVES:
            s = _at(m, pair, "iris", o)
            if not s.empty:
                rows.append((f"{pair}, {o.upper()} on IRIs: {claim}", _fmt(s), verdict(ok(s))))

    family = FAMILY.get(exp, exp)
    if family in ("a", "d"):
        standard_similar(pairs)
        if "identical" in pairs:
            iris_curve("identical", "stays at about 100 (>= 95)", lambda s: s.min() >= 95)
        if "cross-seed" in pairs:
            iris_curve(
                "cross-seed", "falls with depth, to about half at the last block",
                lambda s: None if len(s) < 2 else s.iloc[-1] < s.iloc[0] - 15
                and 30 <= s.iloc[-1] <= 70,
            )  # fmt: skip
        if "cross-supervision" in pairs:
            for o in IRI_OBJECTIVES:
                st, ir = (
                    _at(m, "cross-supervision", "standard", o),
                    _at(m, "cross-supervision", "iris", o),
                )
                if not ir.empty:
                    mid = ir.index[len(ir) // 2 :]
                    gap = (st[mid] - ir[mid]).min()
                    rows.append((
                        f"cross-supervision, {o.upper()}: "
                        "IRIs far below standard from the middle on",
                        f"standard {_fmt(st)}; IRIs {_fmt(ir)}; "
                        f"smallest gap from the middle {gap:.1f}",
                        verdict(gap >= 20),
                    ))  # fmt: skip
        if "cross-bias" in pairs:
            iris_curve(
                "cross-bias",
                "falls to chance (10-12) by the 4th of 9 points (<= 20 from the middle point on)",
                lambda s: s.iloc[len(s) // 2 :].max() <= 20,
            )  # fmt: skip
        hlm = [(p, _at(m, p, "iris", "hlm")) for p in pairs]
        hlm = [(p, s) for p, s in hlm if not s.empty]
        if hlm:
            low = min(float(s.min()) for _, s in hlm)
            rows.append((
                "HLM on IRIs stays high everywhere (>= 80)",
                "; ".join(f"{p}: {_fmt(s)}" for p, s in hlm), verdict(low >= 80),
            ))  # fmt: skip
        if {"dm", "slm", "fula"} <= set(objectives):
            g = t.groupby("objective")["agreement"].mean()
            rows.append((
                "DM gives lower similarity than FuLA and SLM (mean over all runs)",
                f"DM {g['dm']:.1f}, FuLA {g['fula']:.1f}, SLM {g['slm']:.1f}",
                verdict(g["dm"] <= min(g["fula"], g["slm"])),
            ))  # fmt: skip
    elif family == "b":
        score = (
            "robust_agreement"
            if "robust_agreement" in t and t["robust_agreement"].notna().any()
            else "agreement"
        )
        if score != "agreement":
            m = _mean(t, score)
        if score == "agreement":
            standard_similar(pairs)
        last = int(t["point_index"].max())
        for o in IRI_OBJECTIVES:
            for pair in pairs:
                st, ir = _at(m, pair, "standard", o), _at(m, pair, "iris", o)
                if st.empty or ir.empty:
                    continue
                mixed = pair in ("robust->clean", "clean->robust")
                claim = (
                    "IRIs reveal a large gap at deep layers (>= 20 below standard at the last point)"  # noqa: E501
                    if mixed else
                    "robust pairs stay similar on IRIs (within 20 of standard at the last point)"
                    if pair == "robust->robust" else None
                )  # fmt: skip
                if claim is None:
                    continue
                gap = float(st[last] - ir[last])
                rows.append((
                    f"{pair}, {o.upper()} ({score}): {claim}",
                    f"standard {_fmt(st)}; IRIs {_fmt(ir)}; gap at the last point {gap:.1f}",
                    verdict(gap >= 20 if mixed else gap <= 20),
                ))  # fmt: skip
    elif family == "c":
        e = _mean(t, "excess_agreement")
        zero = "about zero"
        expected = {
            "standard": {"hlm": "large", "slm": "large", "fula": "smaller", "dm": zero},
            "iris": {"hlm": "large", "slm": zero, "fula": zero, "dm": zero},
        }
        for proto, expect in expected.items():
            for o in objectives:
                vals = pd.concat([_at(e, p, proto, o) for p in pairs])
                if vals.empty:
                    continue
                mean = float(vals.mean())
                ok = {"large": mean >= 10, "smaller": None, "about zero": abs(mean) <= 5}[expect[o]]
                rows.append((
                    f"{o.upper()} under {proto} stitching: excess agreement {expect[o]}",
                    f"mean {mean:.1f} (min {vals.min():.1f}, max {vals.max():.1f}) over "
                    f"{len(pairs)} markers x {t['point_index'].nunique()} points",
                    verdict(ok),
                ))  # fmt: skip
        if {"fula", "slm", "dm"} <= set(objectives):
            s = {
                o: float(pd.concat([_at(e, p, "standard", o) for p in pairs]).mean())
                for o in ("slm", "fula", "dm")
            }
            rows.append((
                "standard: FuLA exploits the marker much less than SLM, DM hardly",
                f"SLM {s['slm']:.1f}, FuLA {s['fula']:.1f}, DM {s['dm']:.1f}",
                verdict(s["slm"] > s["fula"] > s["dm"]),
            ))  # fmt: skip
    elif family == "coloured_mnist":
        controls = [p for p in pairs if p in ("identical", "cross-seed")]
        misleading = [p for p in pairs if p not in controls]
        standard_similar(pairs)
        for pair in misleading:
            iris_curve(pair, "not similar (<= 30 at every point)", lambda s: s.max() <= 30)
        for pair in controls:
            iris_curve(pair, "stays similar (>= 80 at every point)", lambda s: s.min() >= 80)
    elif family == "e":
        for o in IRI_OBJECTIVES:
            s = _at(m, "identical", "iris", o)
            if not s.empty:
                rows.append((f"identical, {o.upper()}, IRIs on the front branch only: "
                             "stays near 100",
                             _fmt(s), verdict(s.min() >= 95)))  # fmt: skip
    return rows


# ---------------------------------------------------------------------------
# The page


def _md(df: pd.DataFrame) -> str:
    return markdown_table(df, float_format=".1f")


def _models_table(exp_raw: dict, store: Path) -> pd.DataFrame:
    from stitchlab.experiments import with_fingerprints
    from stitchlab.experiments.jobs import model_key
    from stitchlab.models import describe

    rows = []
    exp_raw = with_fingerprints(exp_raw)
    for name in exp_raw["models"]:
        path = store / "models" / model_key(exp_raw, name) / "model.safetensors"
        if not path.exists():
            continue
        d = describe(path)
        ev = d.get("evaluation", {})
        seconds = sum(float(e.get("seconds", 0.0)) for e in d.get("history") or [])
        rows.append({
            "model": name, "method": d.get("method"), "marker": d.get("marker") or "",
            "epochs": d.get("epochs"), "train images": d.get("train_size"),
            "training min": round(seconds / 60, 1),
            **{k.replace("_", " "): v for k, v in ev.items()},
        })  # fmt: skip
    table = pd.DataFrame(rows)
    for column in ("epochs", "train images", "robust samples"):  # counts, also where
        if column in table:  # some models lack them (NaN would make them floats)
            table[column] = table[column].astype("Int64")
    return table


def _agreement_table(t: pd.DataFrame, column: str) -> pd.DataFrame:
    names = t.drop_duplicates("point_index").set_index("point_index")["point"]
    wide = (
        t.groupby(["pair", "protocol", "objective", "point_index"])[column].mean()
        .unstack("point_index")
    )  # fmt: skip
    wide.columns = [f"{i} ({names[i]})" for i in wide.columns]
    return wide.reset_index()


def _jobs(summary) -> str:
    def one(v) -> str:
        if not isinstance(v, dict):
            return str(v)
        return f"{v['run']} of {v['total']}" if "run" in v else f"{v['total']} in all"

    return ", ".join(f"{k} {one(summary[k])}" for k in ("models", "iris", "stitch") if k in summary)


def _commit() -> str:
    def git(*a):
        return subprocess.run(["git", *a], capture_output=True, text=True, cwd=ROOT).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "--short", "HEAD") + (" (with uncommitted changes)" if dirty else "")


def write_page(
    exp: str,
    out: Path,
    store: Path,
    command: str,
    seconds: float,
    summary,
    commit: str,
    rerun: bool = False,
) -> Path:
    """Write docs/validation/<exp>.md (generated part) and copy the figures. ``rerun``: the
    jobs ran earlier (``seconds`` and ``command`` are that run's) and ``summary`` counts
    this page's rerun from the store."""
    from stitchlab.experiments import load_config

    exp_obj = load_config(ROOT / "configs" / "cpu" / f"{CONFIGS[exp]}.toml")
    t = pd.read_csv(out / "results.csv")
    docs = ROOT / "docs" / "validation"
    figs = docs / "figures"
    figs.mkdir(parents=True, exist_ok=True)
    copied = []
    for png in sorted((out / "figures").glob("*.png")):
        if png.name.startswith(("iris-examples", "iri-quality", "layer-average")):
            continue  # in the run's report.html; the page has their numbers as tables
        dest = figs / f"{exp}-{png.name}"
        shutil.copyfile(png, dest)
        copied.append(dest.name)
    jobs = (
        f", by that command; the page was written from a rerun on its store (jobs that rerun "
        f"computed: {_jobs(summary)})"
        if rerun
        else f"; jobs computed by that run (of all the run's jobs; the rest came from the "
        f"shared store): {_jobs(summary)}"
    )
    parts = [
        f"Command: `{command}`",
        f"Commit {commit}; wall time {seconds:.0f} s ({seconds / 60:.1f} min) on 2 CPU "
        f"cores{jobs}; date " + time.strftime("%Y-%m-%d") + ".",
        "Reductions against the paper (from the config):\n\n"
        + "\n".join(f"- {r}" for r in exp_obj.raw.get("reductions", [])),
        "### Base models (test accuracy, %)\n\n" + _md(_models_table(exp_obj.raw, store)),
        "### Findings of [method.md](../method.md) section 7 against this run\n\n"
        + _md(pd.DataFrame(findings(exp, t), columns=["finding", "measured", "verdict"])),
    ]
    score = "excess_agreement" if FAMILY.get(exp, exp) == "c" else "agreement"
    parts.append(
        f"### {score.replace('_', ' ')} (mean over seeds), by point\n\n"
        + _md(_agreement_table(t, score))
    )
    families = front_families(t, score)
    if families is not None:
        parts.append(
            f"### {score.replace('_', ' ')} over the fronts of each family\n\n"
            "Pairs that differ only in the front's number are one family (``cross-seed``, "
            "``cross-seed2``, ...); sd is the sample standard deviation over its fronts.\n\n"
            + _md(families)
        )
        gap = family_gap(t)
        if gap is not None:
            parts.append(
                "### Cross-seed minus cross-bias under IRIs, by point\n\n"
                "The gap of the family means, and the smallest and largest gap over every "
                "pairing of one cross-seed front with one cross-bias front.\n\n" + _md(gap)
            )
    if "robust_agreement" in t and t["robust_agreement"].notna().any():
        parts.append(
            "### agreement under PGD attack, by point\n\n"
            + _md(_agreement_table(t, "robust_agreement"))
        )
    if exp == "d" and (out / "cka.csv").exists():
        cka = pd.read_csv(out / "cka.csv")
        wide = cka.pivot_table(index=["pair", "data"], columns="point_index", values="cka")
        names = cka.drop_duplicates("point_index").set_index("point_index")["point"]
        wide.columns = [f"{i} ({names[i]})" for i in wide.columns]
        wide = wide.map(lambda v: f"{v:.3f}").reset_index()
        parts.append("### Linear CKA (unbiased HSIC), by point\n\n" + _md(wide))
    quality, transfer = iri_quality(t), iri_transfer(t)  # as in the run's report.html
    if quality is not None:
        parts.append(
            "### IRI quality (relative error of the front's activation)\n\n"
            "Mean over the IRI-protocol runs of each set; the null is the median relative "
            "distance between the representations of two different real images at the "
            "point.\n\n" + markdown_table(quality.drop(columns="point_index"), float_format=".3f")
        )
    if transfer is not None:
        parts.append(
            "### Shared invariance without a stitch\n\n"
            "How often each whole model decides on the front's IRIs as on their sources "
            "(%; the back's null: on unrelated images).\n\n" + _md(transfer)
        )
    parts.append("### Figures\n\n" + "\n\n".join(f"![{n}](figures/{n})" for n in copied))
    generated = "\n\n".join(parts)
    page = docs / f"{exp}.md"
    text = (
        page.read_text()
        if page.exists()
        else f"# Validation: {exp_obj.name}\n\n{BEGIN}\n{END}\n\n## Discussion\n\n(to be written)\n"
    )
    head, rest = text.split(BEGIN)[0], text.split(END)[1]
    page.write_text(f"{head}{BEGIN}\n{generated}\n{END}{rest}")
    return page


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiment", choices=sorted(CONFIGS))
    ap.add_argument(
        "--data-root", required=True, help="folder with cifar-10-batches-py/ and MNIST/"
    )
    ap.add_argument("--out", default="runs/validation", help="run folders go to OUT/<experiment>")
    ap.add_argument("--store", default="runs/store", help="job store shared between experiments")
    ap.add_argument("--no-page", action="store_true", help="run only; do not write docs/")
    ap.add_argument(
        "--threads", type=int, default=None, help="torch threads per job (default: the config's, 2)"
    )
    ap.add_argument(
        "--wall",
        type=float,
        default=None,
        help="page only: the wall time (s) of an earlier run of the same jobs",
    )
    ap.add_argument("--command", default=None, help="page only: the command of that run")
    ap.add_argument("--commit", default=None, help="page only: the commit that run ran on")
    args = ap.parse_args()
    from stitchlab.experiments import load_config, run_experiment
    from stitchlab.report import make_report

    root = Path(args.data_root).expanduser().resolve()
    if not (root / "cifar-10-batches-py").is_dir() and not (root / "MNIST").is_dir():
        sys.exit(f"{root} holds neither cifar-10-batches-py/ nor MNIST/; run "
                 "../shared/data/materialize.py ROOT first (../shared/data/README.md)")  # fmt: skip
    os.environ["STITCHLAB_DATA"] = str(root)
    config = ROOT / "configs" / "cpu" / f"{CONFIGS[args.experiment]}.toml"
    out = Path(args.out) / args.experiment
    command = (
        f"python validation/reproduce.py {args.experiment} --data-root DATA "
        f"--out {args.out} --store {args.store}"
        + (f" --threads {args.threads}" if args.threads is not None else "")
    )
    exp = load_config(config)
    if args.threads is not None:  # not part of any job key: results are the same
        exp.raw["run"]["threads"] = args.threads
    commit = _commit()  # the code the run starts on, not what HEAD is when it ends
    t0 = time.perf_counter()
    summary = run_experiment(exp, out, store=args.store)
    make_report(out)
    seconds = time.perf_counter() - t0
    print(f"{args.experiment}: {seconds:.0f} s; results in {out}")
    if args.wall is not None:  # the jobs ran earlier (e.g. with stitchlab run); say so
        seconds, command = args.wall, args.command or command
        commit = args.commit or commit
    if not args.no_page:
        page = write_page(args.experiment, out, Path(args.store), command, seconds, summary, commit,
                          rerun=args.wall is not None)  # fmt: skip
        print(f"page: {page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
