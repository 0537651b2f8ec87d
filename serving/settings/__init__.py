"""Server settings: flags, TGI/LMI environment variables and ``serving.properties``."""
