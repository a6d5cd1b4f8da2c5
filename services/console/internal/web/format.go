package web

import (
	"fmt"
	"strconv"
)

func itoa(n int) string { return strconv.Itoa(n) }

// money renders minor units with two decimals ("12.50 EUR"); the demo's
// currencies all have two.
func money(minor int64, currency string) string {
	if currency == "" {
		return ""
	}
	sign := ""
	if minor < 0 {
		sign, minor = "-", -minor
	}
	return fmt.Sprintf("%s%d.%02d %s", sign, minor/100, minor%100, currency)
}
