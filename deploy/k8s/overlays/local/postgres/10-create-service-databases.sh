#!/bin/sh
# One role and one database per service (each service owns its own
# database), as deploy/compose/postgres/initdb.d does for compose. Each role
# owns its database, so its migrations can create tables in it, and PUBLIC
# loses CONNECT, so no service can open another's database. Passwords equal
# the role names: this is a local development cluster; never reuse them.
#
# The postgres image runs this once, on an empty data directory, as the
# POSTGRES_USER superuser, against a temporary server on the Unix socket.
set -eu

for db in workorder billing providersim; do
	# psql variables (:"db" identifier, :'db' literal) quote the names safely.
	psql -v ON_ERROR_STOP=1 -v db="$db" --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<'SQL'
CREATE ROLE :"db" LOGIN PASSWORD :'db';
CREATE DATABASE :"db" OWNER :"db";
REVOKE ALL ON DATABASE :"db" FROM PUBLIC;
SQL
done
