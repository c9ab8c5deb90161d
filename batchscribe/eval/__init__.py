"""WER evaluation: normalise, score with jiwer, compare, and write report.json / .md / .html."""

from batchscribe.eval.compare import Comparison, compare
from batchscribe.eval.normalize import NORMALIZERS, get_normalizer
from batchscribe.eval.render import write_report
from batchscribe.eval.report import Report, evaluate
from batchscribe.eval.tables import comparison_rows, group_rows, summary_rows

__all__ = ["NORMALIZERS", "Comparison", "Report", "compare", "comparison_rows", "evaluate", "get_normalizer",
           "group_rows", "summary_rows", "write_report"]
