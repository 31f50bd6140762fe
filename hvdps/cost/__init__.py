"""The cost model: what a step and an exchange cost, per method and network, and the analyses built on it
(the projection to other networks and worker counts, the held-out check, the crossover)."""
