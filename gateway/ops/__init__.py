"""Running the gateway: the ``respgate`` command, the pre-flight check, the uvicorn server with its
graceful shutdown, and log set-up. The top floor: it imports the app; nothing imports it."""
