"""Imported only as the forkserver's preload (`loader._worker_context`): the forkserver that starts
DataLoader workers dies with the training process that started it, and its workers with it
(`forksafe.die_with_parent`), so a killed training process leaves no orphaned readers behind."""

from tessera.stream.forksafe import die_with_parent

die_with_parent()
