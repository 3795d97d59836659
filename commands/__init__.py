"""The user's commands, on the roof of the house: ``cdi import``, ``cdi demo``, ``cdi upload``
and the control-plane processes' command lines (``cdi controller``, ``cdi webhook``, ...).

Each is a process edge: flags, the environment and the terminal are read here, once, into the
frozen configs of the floors below (the control plane ``cdi``, the importer, ``datapath``),
which never import this package back. The console script ``cdi`` is ``commands.main:main``;
``python -m cdi`` (what the deployed images run) delegates to it from ``cdi/__main__.py``.
"""
