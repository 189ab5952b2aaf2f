#!/bin/sh
# Run by Patroni once, on the first primary, with a connection URL as $1.
set -eu
psql "$1" -v ON_ERROR_STOP=1 -v user="${APP_DB_USER:-turnlog}" \
    -v password="${APP_DB_PASSWORD:?APP_DB_PASSWORD is unset}" \
    -v db="${APP_DB_NAME:-turnlog}" <<'SQL'
CREATE ROLE :"user" LOGIN PASSWORD :'password';
CREATE DATABASE :"db" OWNER :"user";
SQL
