"""The application layer: what ``sss fit``, ``validate``/``test``, ``export`` and ``predict`` do around `SSSTrainer`.

- `sss.run.parts`: `build_parts`, the one build sequence (data, sizes from the data, model).
- `sss.run.fit`: ``sss fit`` (output folder, resume path, stock callbacks, final evaluation, export).
- `sss.run.evaluate`: ``sss validate`` / ``sss test``.
- `sss.run.export`: ``sss export``; `sss.run.predict`: ``sss predict``.
- `sss.run.launch`: where the process count, precision and accumulation come from; relaunching.
- `sss.run.cluster`: launch arguments from a SLURM / Kubernetes / SkyPilot environment (`python -m sss.run.cluster`).
- `sss.run.notebook`: `notebook_fit`, ``sss fit`` from a notebook.
- `sss.run.folder`: the run folder: claim, numbering, resume path, earlier results, stored config.
- `sss.run.commands`: the ``sss`` subcommands as typed functions (the CLI's table calls them).
- `sss.run.explain`: `explain_error`, an exception -> the one error line and exit code.

``sss/cli.py`` generates the parsers from `sss.run.commands` and calls them; the library parts they use
(`sss.evaluation`, `sss.model_folder`, `sss.checkpoint`) are usable on their own.
"""
