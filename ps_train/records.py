"""What the parameter-server trainers add to the records every trainer writes (metrics.jsonl:
common/formats/schemas.py), declared as ``PSMethod.records`` (ps_train/method.py) and read with
them by the application (hvdps/measure/rows.py): typed and range-checked as the shared fields are.

The header says how the model was split over the PS tasks; the step and summary records carry
what only a job with a shared global step can count: each worker's applied batches, the workers
the chief saw leave, and in sync mode each worker's wait for its token and the gradients dropped
as late (backup workers)."""
from typing import Dict, List, Optional

from common.formats.schemas import Index, NonNeg, Strict, Text


class PSHeader(Strict):
    """The model's split over the PS tasks, as the trainer placed it (ps_train/backend.py)."""
    ps_shard_bytes: Optional[Dict[Text, Index]] = None      # {PS task: model bytes it holds}
    placement: Optional[Dict[Text, List[Text]]] = None      # {variable: the devices holding it}
    cluster: Optional[Dict[Text, List[Text]]] = None        # the cluster spec the job ran on
    replicas_to_aggregate: Optional[Index] = None           # sync: gradients an update averages
    ps_api: Optional[Text] = None                           # v2: TensorFlow 2's strategy
    loss_source: Optional[Text] = None                      # whose batches the logged loss is of


class PSStep(Strict):
    """Every worker's progress at a logged update, read from the PS."""
    worker_steps: Optional[List[Index]] = None              # each worker's applied batches so far
    sync_wait_total_s: Optional[List[NonNeg]] = None        # sync: each worker's wait for tokens so far
    sync_wait_s: Optional[NonNeg] = None                    # sync: the mean wait per worker step since the last log
    lost_workers: Optional[List[Text]] = None


class PSSummary(Strict):
    """The job's end as the chief counted it."""
    worker_steps: Optional[List[Index]] = None
    sync_wait_total_s: Optional[List[NonNeg]] = None
    lost_workers: Optional[List[Text]] = None
    dropped_gradients: Optional[Index] = None               # sync: pushed, never applied (late: backups)
    updates_applied: Optional[Index] = None                 # v2: the optimizer's count on the PS


RECORDS = {"header": PSHeader, "step": PSStep, "summary": PSSummary}
