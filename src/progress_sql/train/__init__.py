"""Training: policy loading, generation backends, SFT warm start, the RL trainer.

Every module here may import torch and transformers; the task modules (sql/, odt/, rewards/,
envs/) never import from here. This package file stays import-light (no torch at import), so
``import progress_sql.train`` is cheap; import the submodules you need:

- ``train.policy``: ``load_policy``, ``chat_prompt_ids``, ``load_smollm2``
- ``train.tiny``: ``train_tokenizer``, ``build_tiny_model`` (the CPU policy), ``copy_warmup``
- ``train.generation``: ``Sample``, ``GenerationBackend``, ``TransformersBackend``,
  ``VLLMBackend``, ``make_backend``
- ``train.sft``: ``build_sft_examples``, ``run_sft``, ``greedy_ex``
"""
