"""KV files on disk: one file's format (kvfile), the block store shared by files (kvstore), and
the index that finds a prompt's file by its tokens (kvindex)."""
