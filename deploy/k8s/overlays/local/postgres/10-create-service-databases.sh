#!/bin/sh
# Two roles and one database per service, as deploy/compose/postgres/initdb.d
# does for compose: <db> owns the database and its tables (`<service>
# migrate` runs as it), <db>_app is the runtime role the service connects as,
# granted by migrate (DATABASE_RUNTIME_ROLE): read-write on the tables, only
# INSERT and SELECT on the audit tables. PUBLIC loses CONNECT, so no service
# can open another's database. Passwords equal the role names: this is a
# local development cluster; never reuse them.
#
# The postgres image runs this once, on an empty data directory, as the
# POSTGRES_USER superuser, against a temporary server on the Unix socket.
set -eu

for db in workorder billing providersim; do
	# psql variables (:"db" identifier, :'db' literal) quote the names safely.
	psql -v ON_ERROR_STOP=1 -v db="$db" -v app="${db}_app" --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<'SQL'
CREATE ROLE :"db" LOGIN PASSWORD :'db';
CREATE ROLE :"app" LOGIN PASSWORD :'app';
CREATE DATABASE :"db" OWNER :"db";
REVOKE ALL ON DATABASE :"db" FROM PUBLIC;
GRANT CONNECT ON DATABASE :"db" TO :"app";
SQL
done
