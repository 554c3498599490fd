"""Run reports: `report.html` and its PNGs, made from a run folder's files.

`write_report(folder)` (also `kerasfast.write_report`, and the command
`kerasfast report FOLDER`) reads the JSON a run or an export left
(`sources`), draws the figures (`plots`) and assembles one self-contained
page (`page`).

Example:

>>> x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
>>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
>>> result = kerasfast.fit(model, x, x.sum(axis=1), epochs=3, loss="mse", run_dir="runs/first",
...                        verbose=0)  # writes runs/first/report.html
>>> kerasfast.write_report("runs/first")  # regenerates it
PosixPath('runs/first/report.html')
"""

from kerasfast.reporting.report import REPORT_FILE, report_or_warning, write_report

__all__ = ["REPORT_FILE", "report_or_warning", "write_report"]
