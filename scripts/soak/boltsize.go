package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// boltSize prints "IN_USE_BYTES RECORDS" for a file store: the bytes of its
// pages in use (the file's size less the pages on bbolt's free list, which
// later records reuse: bbolt never shrinks its file, and less the pages of
// that list itself, which describe free space) and the number of
// resource records. The running gate holds the file's lock, so it measures
// a copy; take it while the store is idle (between runs, after the
// retention's sweep), when the copy is a committed state. The copy is
// opened for writing: bbolt loads its free list only then.
func boltSize(args []string) error {
	fs := flag.NewFlagSet("boltsize", flag.ExitOnError)
	file := fs.String("file", "", "the file store's path")
	_ = fs.Parse(args)
	if *file == "" {
		return errors.New("boltsize needs -file")
	}
	cp := filepath.Join(os.TempDir(), fmt.Sprintf("soak-boltsize-%d.db", os.Getpid()))
	defer os.Remove(cp)
	if err := copyFile(*file, cp); err != nil {
		return err
	}
	db, err := bolt.Open(cp, 0o600, &bolt.Options{Timeout: 10 * time.Second})
	if err != nil {
		return err
	}
	defer db.Close()
	return db.View(func(tx *bolt.Tx) error {
		st := db.Stats()
		free := int64(st.FreePageN+st.PendingPageN)*int64(db.Info().PageSize) + int64(st.FreelistInuse)
		records := 0
		if b := tx.Bucket([]byte("records")); b != nil {
			records = b.Stats().KeyN
		}
		fmt.Println(tx.Size()-free, records)
		return nil
	})
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
