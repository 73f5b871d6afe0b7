package proxy_test

import (
	"fmt"
	"log"
	"net/url"

	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/proxy"
)

func ExampleParseRules() {
	rules, err := proxy.ParseRules(`
		PUT,PATCH,DELETE /jobs/{id}        fence job:{id}
		POST             /jobs/{id}/finish fence strict job:{id}
		POST             /healthcheck      pass   # no token needed
		*                /admin/{rest...}  deny`)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range rules {
		fmt.Printf("%d %v %s %s strict=%v %q\n", r.Line, r.Methods, r.Pattern, r.Action, r.Strict, r.Template)
	}
	_, err = proxy.ParseRules("PUT /jobs/{id} fence job/{id}")
	fmt.Println(err)
	// Output:
	// 2 [PUT PATCH DELETE] /jobs/{id} fence strict=false "job:{id}"
	// 3 [POST] /jobs/{id}/finish fence strict=true "job:{id}"
	// 4 [POST] /healthcheck pass strict=false ""
	// 5 [] /admin/{rest...} deny strict=false ""
	// rules: line 1: "PUT /jobs/{id} fence job/{id}": template "job/{id}": '/' is not allowed in a resource name (use A-Z a-z 0-9 . _ : ~ -)
}

func ExampleNew() {
	upstream, _ := url.Parse("http://127.0.0.1:9000")
	rules, _ := proxy.ParseRules("PUT /jobs/{id} fence job:{id}")
	gate, err := proxy.New(proxy.Options{
		Upstream: upstream,
		Store:    memstore.New(memstore.Options{}), // use a durable store in production
		Rules:    rules,
	})
	if err != nil {
		log.Fatal(err)
	}
	srv := proxy.NewServer(gate, proxy.ServerOptions{})
	_ = srv // ln, _ := net.Listen("tcp", "127.0.0.1:8080"); srv.Serve(ln)
	fmt.Println("ready")
	// Output: ready
}
