"""Model files: what a GGUF file says (gguf_info), finding and checking one (model_file,
catalog), how many slots fit in memory (kv_budget), and downloading one (pull, setup_model)."""
