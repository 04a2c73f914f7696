"""Experiment trackers as loggers: `MLflowLogger` (mlflow_logger.py) and `WandBLogger` (wandb_logger.py),
one module each. Importing them is cheap: each imports its library (slow: mlflow, wandb) only when a run
starts. What they share, the tracker run id kept with the run's logs and the config as params without
secrets, is in record.py. See docs/trackers.md.

    from tessera.train.trackers import MLflowLogger, WandBLogger
"""

from tessera.train.trackers.mlflow_logger import MLflowLogger
from tessera.train.trackers.wandb_logger import WandBLogger

__all__ = ["MLflowLogger", "WandBLogger"]
