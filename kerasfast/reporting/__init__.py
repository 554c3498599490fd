"""Run reports: `report.html` and its PNGs, made from a run folder's files.

`write_report(folder)` (also `kerasfast.write_report`, and the command
`kerasfast report FOLDER`) reads the JSON a run or an export left
(`sources`), draws the figures (`plots`) and assembles one self-contained
page (`page`).

Example:

>>> result = kerasfast.fit(model, x, y, epochs=3, run_dir="runs/first")  # writes runs/first/report.html
>>> kerasfast.write_report("runs/first")  # regenerates it
PosixPath('runs/first/report.html')
"""

from kerasfast.reporting.report import REPORT_FILE, report_or_warning, write_report

__all__ = ["REPORT_FILE", "report_or_warning", "write_report"]
