package netfault

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// nftables makes packet loss on loopback with rules in a table of this
// process's own, "inet netfault_<pid>": one input-hook chain whose
// rules drop, with nftables' numgen random, a share of the packets to and
// from a link's port (both directions of the client's side of the link).
// Nothing outside that table is touched.
type nftables struct {
	path  string
	table string
	loss  map[*Fault]lossRule
}

type lossRule struct {
	ports    []int
	permille int
}

// tablePrefix names every harness's table; the suffix is its process id.
const tablePrefix = "netfault_"

var tableRE = regexp.MustCompile(`table inet ` + tablePrefix + `(\d+)`)

// openNFTables makes the table of process pid after removing those of
// harness processes that are gone.
func openNFTables(pid int) (*nftables, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("netfault: nftables needs root")
	}
	path, err := exec.LookPath("nft")
	if err != nil {
		return nil, fmt.Errorf("netfault: nftables: %w (Debian package nftables)", err)
	}
	n := &nftables{path: path, table: tablePrefix + strconv.Itoa(pid), loss: map[*Fault]lossRule{}}
	out, err := n.run("list tables")
	if err != nil {
		return nil, err
	}
	for _, m := range tableRE.FindAllStringSubmatch(out, -1) {
		other, _ := strconv.Atoi(m[1])
		if other == pid || alive(other) {
			continue
		}
		if _, err := n.run("delete table inet " + tablePrefix + m[1]); err != nil {
			return nil, fmt.Errorf("netfault: remove a leftover table: %w", err)
		}
	}
	_, _ = n.run("delete table inet " + n.table) // ours, from a process that had our pid
	if err := n.apply(); err != nil {
		return nil, err
	}
	return n, nil
}

// alive reports whether process pid exists.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func (n *nftables) setLoss(f *Fault, ports []int, p float64) error {
	n.loss[f] = lossRule{ports: ports, permille: int(p*1000 + 0.5)}
	if err := n.apply(); err != nil {
		delete(n.loss, f)
		return err
	}
	return nil
}

func (n *nftables) clearLoss(f *Fault) error {
	delete(n.loss, f)
	return n.apply()
}

// apply replaces the table's rules with the current loss rules, in one
// atomic nft transaction.
func (n *nftables) apply() error {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {}\nflush table inet %s\n", n.table, n.table)
	fmt.Fprintf(&b, "table inet %s {\n  chain input {\n    type filter hook input priority -10; policy accept;\n", n.table)
	var rules []string
	for _, r := range n.loss {
		if r.permille <= 0 {
			continue
		}
		set := portSet(r.ports)
		for _, dir := range []string{"dport", "sport"} {
			if r.permille >= 1000 {
				rules = append(rules, fmt.Sprintf("    iifname \"lo\" tcp %s %s drop\n", dir, set))
				continue
			}
			rules = append(rules, fmt.Sprintf("    iifname \"lo\" tcp %s %s numgen random mod 1000 < %d drop\n", dir, set, r.permille))
		}
	}
	sort.Strings(rules)
	for _, r := range rules {
		b.WriteString(r)
	}
	b.WriteString("  }\n}\n")
	_, err := n.runScript(b.String())
	return err
}

func portSet(ports []int) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = strconv.Itoa(p)
	}
	return "{ " + strings.Join(s, ", ") + " }"
}

// remove deletes the table and with it every rule.
func (n *nftables) remove() error {
	_, err := n.run("delete table inet " + n.table)
	return err
}

func (n *nftables) run(cmd string) (string, error) {
	c := exec.Command(n.path, strings.Fields(cmd)...) //nolint:noctx // nft returns at once
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Run(); err != nil {
		return "", fmt.Errorf("netfault: nft %s: %w: %s", cmd, err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

func (n *nftables) runScript(script string) (string, error) {
	c := exec.Command(n.path, "-f", "-") //nolint:noctx // nft returns at once
	c.Stdin = strings.NewReader(script)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Run(); err != nil {
		return "", fmt.Errorf("netfault: nft -f: %w: %s\n%s", err, strings.TrimSpace(errb.String()), script)
	}
	return out.String(), nil
}
