"""mcgpo as a verl 0.9.1 plugin (``pip install mcgpo[verl]``); docs/integrations/verl.md.

Importing this package imports nothing from verl. ``import verl`` loads the entry point
``mcgpo = mcgpo.integrations.verl.plugin`` (group ``verl.plugins``), which registers:

* the agent loop ``mcgpo_env`` (:mod:`.agent_loop`): one mcgpo environment episode per
  verl sample, one output per environment step;
* the v1 trainer ``mcgpo`` (:mod:`.trainer`, ``trainer.v1.trainer_mode=mcgpo``): advantages
  and MCGPO preferences from the StepTable of the step outputs (:mod:`.batch`);
* the actor loss (:mod:`.loss`), installed with ``set_loss_fn``: verl's PPO loss plus
  ``lambda_pair`` times mcgpo's pair loss;
* for CPU runs (tests, smoke runs): the rollout backend ``mcgpo_cpu`` (:mod:`.cpu_replica`)
  and the platform ``cpu`` (:mod:`.cpu_platform`, ``VERL_PLATFORM=cpu``).
"""
