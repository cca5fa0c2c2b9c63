// Command htpasswd prints one bcrypt htpasswd line, "USER:HASH", for the
// password read from standard input, so the password never appears in an
// argv or a log. distribution's htpasswd auth accepts only bcrypt entries and
// the project's Python has no bcrypt (the standard library's crypt module is
// deprecated and gone in 3.13), so localcluster/registry.py runs this.
//
// The cost is bcrypt's minimum: distribution checks the hash on every request
// (no session), which costs about 85 ms of CPU per request at the default cost
// 10 on this project's 2-core machines, and the plaintext password sits in the
// same 0700 state directory as this file, so a slower hash protects nothing.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/crypto/bcrypt"
)

func main() {
	if len(os.Args) != 2 || os.Args[1] == "" || strings.ContainsAny(os.Args[1], ":\n") {
		fmt.Fprintln(os.Stderr, "usage: htpasswd USER < password (USER without ':' or newline)")
		os.Exit(2)
	}
	password, err := io.ReadAll(bufio.NewReader(os.Stdin))
	if err != nil {
		fmt.Fprintln(os.Stderr, "htpasswd: reading the password:", err)
		os.Exit(1)
	}
	password = []byte(strings.TrimRight(string(password), "\n"))
	if len(password) == 0 {
		fmt.Fprintln(os.Stderr, "htpasswd: the password on standard input is empty")
		os.Exit(2)
	}
	hash, err := bcrypt.GenerateFromPassword(password, bcrypt.MinCost)
	if err != nil {
		fmt.Fprintln(os.Stderr, "htpasswd:", err)
		os.Exit(1)
	}
	fmt.Printf("%s:%s\n", os.Args[1], hash)
}
