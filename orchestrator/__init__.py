"""The rollout orchestrator: tasks x samples, each played by a harness in its own sandbox and
scored by the task's verifier, with lifecycle and reward events through the proxy.

- :mod:`orchestrator.plan`: which rollouts to run (a group per task, for group-relative
  advantages);
- :mod:`orchestrator.backend`: the rollout-backend interface; :mod:`orchestrator.registry` names
  the backends and builds each from its own config section;
- :mod:`orchestrator.local`: the local backend (bubblewrap sandboxes on this machine);
- :mod:`orchestrator.kubernetes`: the Kubernetes backend (one pod per rollout), with the pod
  (:mod:`~orchestrator.kube_pod`), the run's other objects (:mod:`~orchestrator.kube_objects`),
  its API calls (:mod:`~orchestrator.kube_api`), waiting on pods
  (:mod:`~orchestrator.kube_wait`) and reading pod status (:mod:`~orchestrator.kube_status`);
- :mod:`orchestrator.run`: concurrency, keys, retries of infrastructure failures (and nothing
  else), events, cancellation;
- :mod:`orchestrator.rundir`: the run directory and the summary;
- :mod:`orchestrator.progress`: the live progress display.
"""
