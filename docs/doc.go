// Package docs holds fencegate's documentation (the *.md files beside this
// one) and the tests that keep it honest: every link resolves, the README
// stays short, and nothing points outside the repository.
package docs
