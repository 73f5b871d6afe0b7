module github.com/fencegate/fencegate

go 1.26

require (
	github.com/caarlos0/env/v11 v11.4.2 // indirect
	github.com/go-chi/chi/v5 v5.5.0 // indirect
	github.com/valkey-io/valkey-go v1.0.79 // indirect
	go.etcd.io/bbolt v1.5.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
)
