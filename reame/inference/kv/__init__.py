"""KV files: one file's format (kvfile), the store of files by name (kvstore), the index that
finds a prompt's file by its tokens (kvindex), and where their bytes are kept (blobs)."""
