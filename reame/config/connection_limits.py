"""How many connections the server holds, and the open files that takes (read by the HTTP
protocol, reame/web/http/connections.py, and by the service unit's LimitNOFILE)."""

HEADERS_S = 10.0  # to send a request's headers (slowloris)
PER_ADDRESS = 128  # connections from one address (a browser holds a few per tab)
TOTAL = 2048  # connections in all
OPEN_FILES = 8192  # LimitNOFILE: the connections, the database and the KV files
