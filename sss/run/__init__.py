"""The application layer: what ``sss fit``, ``validate``/``test``, ``export`` and ``predict`` do around `SSSTrainer`.

- `sss.run.parts`: `build_parts`, the one build sequence (data, sizes from the data, model).
- `sss.run.fit`: ``sss fit`` (output folder, resume path, stock callbacks, final evaluation, export).
- `sss.run.evaluate`: ``sss validate`` / ``sss test``.
- `sss.run.export`: ``sss export``; `sss.run.predict`: ``sss predict``.
- `sss.run.launch`: where the process count, precision and accumulation come from; relaunching.
- `sss.run.cluster`: launch arguments from a SLURM / Kubernetes / SkyPilot environment (`python -m sss.run.cluster`).
- `sss.run.notebook`: `notebook_fit`, ``sss fit`` from a notebook.

``sss/cli.py`` parses the command line and calls these; the library parts they use
(`sss.evaluation`, `sss.model_folder`, `sss.checkpoint`) are usable on their own.
"""
