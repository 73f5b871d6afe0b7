module github.com/fencegate/fencegate

go 1.26.0

require (
	github.com/caarlos0/env/v11 v11.4.2
	github.com/go-chi/chi/v5 v5.5.0
	github.com/valkey-io/valkey-go v1.0.79
	go.etcd.io/bbolt v1.5.0
)

require golang.org/x/sys v0.47.0 // indirect
