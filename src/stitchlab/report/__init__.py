"""Figures and a self-contained HTML page from the result files of a run directory.

Reads only tables (pandas) and, for the example IRIs, one safetensors file (numpy); never
imports torch or the stitching code. Figures use matplotlib's Agg canvas (no display)::

    make_report(run_dir)                   -> run_dir/report.html (+ run_dir/figures/*.png|pdf)
    load_run(run_dir)                      -> RunData (results, pairs, cka, examples)
    layer_averages(results)                -> layer-averaged agreement table
    plot_agreement_curves(results, ...)    -> Figure (one panel per pair)
"""

from .build import layer_average_matrix, make_report, save_figure
from .figures import (
    plot_agreement_curves,
    plot_cka,
    plot_excess_agreement,
    plot_iri_examples,
    plot_iri_quality,
    plot_layer_averages,
    plot_robust_curves,
    robust_pairs,
)
from .inputs import (
    RESULTS_REQUIRED,
    IRIExamples,
    MissingColumnError,
    MissingResultsError,
    ReportInputError,
    RunData,
    load_cka,
    load_iris_examples,
    load_pairs,
    load_results,
    load_run,
)
from .markdown import markdown_table
from .tables import (
    curve_stats,
    front_reference,
    infer_num_classes,
    iri_quality,
    iri_transfer,
    layer_averages,
)

__all__ = [
    "make_report",
    "markdown_table",
    "load_run",
    "load_results",
    "load_pairs",
    "load_cka",
    "load_iris_examples",
    "RunData",
    "IRIExamples",
    "RESULTS_REQUIRED",
    "ReportInputError",
    "MissingColumnError",
    "MissingResultsError",
    "layer_averages",
    "layer_average_matrix",
    "curve_stats",
    "iri_quality",
    "iri_transfer",
    "front_reference",
    "infer_num_classes",
    "plot_agreement_curves",
    "plot_robust_curves",
    "plot_excess_agreement",
    "plot_cka",
    "plot_iri_examples",
    "plot_iri_quality",
    "plot_layer_averages",
    "robust_pairs",
    "save_figure",
]
