"""Running the server for its admin: live changes to reame.conf from the Settings tab
(live_settings), backup and restore (backup), and the systemd unit (service_unit)."""
