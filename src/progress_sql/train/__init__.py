"""Training: SFT warm start, the RL trainer, the tiny CPU policy, losses, checkpoints.

Every module here may import torch and transformers; nothing below this package (the task
module, ``inference``, ``eval``) imports from here. Generation and model loading are
``progress_sql.inference``'s. This package file stays import-light (no torch at import), so
``import progress_sql.train`` is cheap; import the submodules you need:

- ``train.trainer``: ``run_rl`` (multi-turn GRPO / GSPO / Dr.GRPO), the loop; around it ``train.rl_run``
  (what a run holds, ``open_run``), ``train.questions`` (which questions, in which order) and
  ``train.resume`` (the run's state, its fingerprint, going on from a checkpoint)
- ``train.trajectories``: an episode as the token ids, mask and log-probs the trainer consumes
- ``train.losses``: group advantages, the GRPO / GSPO losses
- ``train.sft``: ``build_sft_examples``, ``run_sft``, ``greedy_ex``
- ``train.tiny``: ``train_tokenizer``, ``build_tiny_model`` (the CPU policy), ``copy_warmup``
- ``train.checkpoint``, ``train.distributed``: resumable checkpoints, DeepSpeed or plain torch
"""
