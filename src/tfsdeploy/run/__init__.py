"""The run layer: the engine that owns a run, the verbs' run plans, the jobs, the changes the
operations yield and the executor that applies them. It reaches hosts only through
``tfsdeploy.hosts``."""
