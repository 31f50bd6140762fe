"""The application tier: what a user runs above the two trainers.

launchers (how to start a job of each backend; the one name -> launcher map),
compare (hvdps compare: run them side by side), report (table, CSV/JSON,
plots), projection (hvdps project: the alpha-beta extrapolation), hosts
(hvdps hosts). Imports common/, never the reverse.
"""
