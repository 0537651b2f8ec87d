"""Starting the server: the command line, uvicorn, ``jaxgen run-batch`` (the engine they load
is built by ``serving.model_loading``, which Ray Serve's ``serving.ray_app`` and a multi-host
pod's ``serving.pod`` share)."""
