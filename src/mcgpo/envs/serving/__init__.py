"""Environments as services: ``mcgpo env serve`` and the ``remote`` environment.

* :mod:`~mcgpo.envs.serving.server`, :mod:`~mcgpo.envs.serving.sessions`,
  :mod:`~mcgpo.envs.serving.launch`: the HTTP server (Starlette on uvicorn), one worker
  process per session, a step timeout, graceful shutdown.
* :mod:`~mcgpo.envs.serving.client`: :class:`RemoteEnv`, the env protocol over HTTP (httpx).
* :mod:`~mcgpo.envs.serving.wire`: the JSON bodies both ends share.
* :mod:`~mcgpo.envs.serving.security`: bind and token rules.

The server needs the ``serve`` extra (``pip install 'mcgpo[serve]'``); nothing here is
imported by ``import mcgpo``. The protocol is written out in docs/envs/serving.md.
"""
