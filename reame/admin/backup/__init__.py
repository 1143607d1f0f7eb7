"""`python app.py backup DIR` and `python app.py restore DIR`: a copy of a Reame's data taken
while it serves, and putting one back.

A backup folder holds:

    reame.db        the database: a consistent snapshot (SQLite's online backup API)
    kv/             the KV files and the cache's totals, each file checked whole
    users.json      the accounts file, mode 0600 (if [server] users_file is set)
    reame.conf      the config file
    manifest.json   written last: every file's part, size and SHA-256

With [storage] database_url the chats are in PostgreSQL: a backup then holds everything but
the database (its manifest says so), which is PostgreSQL's own tools' to copy (pg_dump, and
pg_restore to put it back); backup and restore say so when they finish.

A folder without manifest.json is a backup that did not finish: restore refuses it. Restore
checks every file against the manifest before it touches anything, and refuses while a process
(a running server) has the target database open. It never deletes: what it replaces is moved
aside (`<name>.before-restore-<time>`), and only with force. The config file comes back only
when asked (with_config): a new machine usually keeps its own paths and port; then the data go
where the backup's config says, read as if it were the target's file.

manifest.py: what a backup holds; take.py: backup; restore.py: restore; cli.py: the commands.
"""

from reame.admin.backup.cli import run_backup, run_restore
from reame.admin.backup.manifest import MANIFEST_NAME, POSTGRESQL, BackupError, check_backup
from reame.admin.backup.restore import restore
from reame.admin.backup.take import backup

__all__ = ["MANIFEST_NAME", "POSTGRESQL", "BackupError", "backup", "check_backup", "restore",
           "run_backup", "run_restore"]
