"""Starting the server: the command line, uvicorn, the engine it loads, ``jaxgen run-batch``
(a multi-host pod's launcher is ``serving.pod``, Ray Serve's ``serving.ray_app``)."""
