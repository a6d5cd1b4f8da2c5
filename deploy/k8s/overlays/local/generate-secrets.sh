#!/bin/sh
# Writes the local overlay's generated secrets, once: secrets/ (git-ignored)
# holds the local issuer's clients, each with a random secret and the
# audiences it may get tokens for, which kustomization.yaml's secretGenerator
# reads. Run before `kubectl apply -k` (deploy/k8s/README.md); an existing
# file is kept, so the services' and the issuer's secrets stay the same
# across applies. Remove secrets/ to rotate them.
set -eu

dir="$(cd "$(dirname "$0")" && pwd)/secrets"
file="$dir/localissuer-clients.env"
[ -f "$file" ] && exit 0

rand() { od -An -N32 -tx1 /dev/urandom | tr -d ' \n'; }
mkdir -p "$dir"
umask 077
workorder=$(rand) console=$(rand) demo=$(rand) operator=$(rand)
every="workorder|provider-sim|billing|console"
tmp="$file.tmp"
{
	# The issuer's LOCALISSUER_CLIENTS, id:secret:audiences: workorder hands
	# off to provider-sim; the console and an operator at the command line
	# reach every service; the demo client the public APIs.
	echo "clients=workorder:$workorder:provider-sim,console:$console:$every,demo:$demo:workorder|billing,operator:$operator:$every"
	# Each client's secret alone, for the pods that are that client and for
	# whoever calls from outside (demo, operator).
	echo "workorder=$workorder"
	echo "console=$console"
	echo "demo=$demo"
	echo "operator=$operator"
} >"$tmp"
mv "$tmp" "$file"
