"""The study's encoder as the engine runs it: a plug-in of the driver like any other kind of
sweep. ``trial`` runs one of its cells on Ray (directly, or as a DDP ``TorchTrainer``: the typed
``TrialJob`` crosses the Ray boundary); ``workload`` is what the driver asks of the study's
sweeps (its jobs, what its parent run records, what is kept when a cell finishes, how a
finished trial is said), declared as ``study`` in the entry-point group ``fusion_ray.workloads``;
``forecast`` is the planner's (``fusion-ray plan``): the study's adaptive schedule replayed on
results drawn from a pilot or stated effects, by dataset and operator. The engine (``fusion_ray.driver``, ``fusion_ray.policy``, ``fusion_ray.decide``) imports nothing of
this package, of the model, the data or the training loop."""
