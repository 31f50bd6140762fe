"""What a cost model reads of a run: a typed shape that a measured run (hvdps.measure.rows.RunRow) has
too, so the projection and the crossover can ask the same model about runs no one made."""
import dataclasses
from typing import Optional, Tuple

from hvdps import methods


@dataclasses.dataclass(frozen=True)
class StepShape:
    workers: int
    compute_s: float
    grad_bytes_per_step: Optional[float]
    backend: Optional[str] = None
    mode: Optional[str] = None
    tasks: Tuple[Tuple[str, int], ...] = ()     # besides the workers, by role (("ps", 2),)
    settings: Tuple[Tuple[str, str], ...] = ()  # its method's own, as a run's ((name, value), ...)

    @property
    def method(self):
        """Its method's registry entry, as a measured run's (hvdps/measure/rows.py: RunRow.method)."""
        return methods.lookup(self.backend) if self.backend else None
