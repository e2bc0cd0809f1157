def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs CUDA GPUs (the nccl backend); skipped elsewhere")
