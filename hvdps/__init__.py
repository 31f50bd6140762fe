"""The application: what a user runs above the methods' trainers (one package each, collected by
methods.py's registry).

commands/ (one module per hvdps command: compare, tune, project, emulate, hosts, k8s, launch, data),
measure/ (runs started, read and measured: identities, jobs, links, cgroups, rows), cost/ (each
method family's cost model, the projection, its held-out checks and the replay of run timelines),
tune/ (the search and best/), render/ (reports, tables, plots), k8s/ and install/. Imports common/,
never the reverse.
"""
