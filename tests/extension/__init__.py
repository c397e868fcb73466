"""The worked example of contract v3: families from modules outside privstream's packages.

``site/`` stands for another installed distribution: each example family is a module there with
its own ``<name>-0.0.dist-info/entry_points.txt`` in the ``privstream.families`` group (what
``pip install`` leaves). Nothing in privstream names them; the fixtures of ``conftest.py`` put
``site/`` on ``sys.path`` (and ``PYTHONPATH`` for subprocesses) and forget the cached discovery.
"""
