"""The OpenAI-compatible API as a layer below the inference server and the orchestrator's agent gateway: request
models and parsing (`protocol`), the access policy and request guard (`access`, `guard`), the app, its errors and the
answers' shapes (`http_api`). It imports neither component (`tests/test_structure.py`)."""
