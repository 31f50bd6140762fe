"""hvdps tune: each method's settings searched, its best found through its real launcher, and the
methods compared best against best (hvdps/commands/tune.py is the command). space.py turns each
method's declared axes (``Method.space``) into candidates, search.py ranks them by the method's cost
model, halves them on measured runs and judges the finalists, trials.py runs a trial (or reads one
back) within the budget."""
