"""Running the model: the llama.cpp engine and its slots (engine, batches), the scheduler that
shares them (scheduler), prompts (prompt), the KV cache on disk (cache, kv/), one turn from
restore to reply (turn, turn_stream), the loaded model as one swappable thing
(model_runtime), and the warm-up at start (warmup). Knows nothing of stored chats."""
