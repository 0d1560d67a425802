"""Inference: model loading, the generation backends (transformers, vLLM) and the one policy
adapter, ``ChatModel``, that rollouts, evaluation, SFT checks and serving generate with.

>>> from progress_sql.envs import Request
>>> from progress_sql.inference.policy import ChatModel
>>> with ChatModel.load("outputs/rl", settings.generation) as model:      # doctest: +SKIP
...     model.complete([Request(messages, "think_sql")], n=1, temperature=0.0,
...                    top_p=1.0, seed=None)[0][0].text

Modules, each imported by name (this package imports none of them, so ``import
progress_sql.inference.settings`` imports no torch; the task module below this package, sql,
odt, formats, rewards and envs, never does): ``models`` (loading: ``load_policy``,
``PolicyLoadError``), ``backends`` (sampling, one module per backend: ``make_backend``,
``GenerationBackend``, ``Sample``), ``policy`` (``ChatModel`` and the token-exact
``TokenPolicy`` of rollouts), ``ask`` (answering users' questions), ``settings`` (params.yaml
``generation`` and the names of the backends; torch-free).
"""
