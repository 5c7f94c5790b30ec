"""The run layer that experiments, comparisons and the oracle share.

Each of the three is a job definition on it:

* settings read and checked one way (:mod:`stitchlab._checks`: TOML tables, field types,
  unknown keys refused with the valid ones named);
* a :class:`Plan` with its stages, what is stored and a time estimate, printed before a run
  (``--plan`` prints it and stops);
* one content-keyed store (:mod:`stitchlab.store`: :func:`~stitchlab.store.stable_hash`
  keys, atomic checksummed entries, locks), so a rerun resumes and two processes never
  compute one job twice;
* one executor interface (:class:`LocalExecutor`, :class:`RayExecutor`: ``configure(run)``
  then ``map(fn, jobs)``; on Ray each job asks for its CPUs and GPUs);
* one writer of tables (:func:`write_table`: ``results.csv`` and ``results.parquet``).
"""

from .executors import LocalExecutor, RayExecutor, assigned_device, gpus_for
from .plan import Plan, Stage, duration, seconds_per_image
from .tables import read_table, write_table

__all__ = [
    "Plan",
    "Stage",
    "duration",
    "seconds_per_image",
    "LocalExecutor",
    "RayExecutor",
    "assigned_device",
    "gpus_for",
    "write_table",
    "read_table",
]
