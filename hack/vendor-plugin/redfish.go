package main

// The node's GPUs from a Redfish service: the ComputerSystem whose UUID is the node's
// systemUUID, and its Processors of type GPU that are not absent or disabled; the same
// rule as dra_driver/sources/redfish.py. Plain HTTP+JSON: a test double needs no client.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"
)

type gpu struct{ uuid, productName string }

type redfish struct {
	base           string
	user, password string
	http           *http.Client
}

func newRedfish(endpoint, credentialsFile string) (*redfish, error) {
	r := &redfish{base: strings.TrimRight(endpoint, "/"), http: &http.Client{Timeout: 10 * time.Second}}
	if credentialsFile != "" {
		raw, err := os.ReadFile(credentialsFile)
		if err != nil {
			return nil, err
		}
		var c struct{ Username, Password string }
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("credentials file %s: %w", credentialsFile, err) // no content in the error
		}
		r.user, r.password = c.Username, c.Password
	}
	return r, nil
}

func (r *redfish) get(ctx context.Context, path string, into any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.base+path, nil)
	if err != nil {
		return err
	}
	if r.user != "" {
		req.SetBasicAuth(r.user, r.password)
	}
	resp, err := r.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %d", path, resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(into)
}

type link struct {
	ID string `json:"@odata.id"`
}

func (r *redfish) members(ctx context.Context, path string) ([]string, error) {
	var coll struct{ Members []link }
	if err := r.get(ctx, path, &coll); err != nil {
		return nil, err
	}
	out := make([]string, 0, len(coll.Members))
	for _, m := range coll.Members {
		out = append(out, m.ID)
	}
	return out, nil
}

func (r *redfish) nodeGPUs(ctx context.Context, systemUUID string) ([]gpu, error) {
	systems, err := r.members(ctx, "/redfish/v1/Systems")
	if err != nil {
		return nil, err
	}
	for _, path := range systems {
		var sys struct {
			UUID       string
			Processors link
		}
		if err := r.get(ctx, path, &sys); err != nil {
			return nil, err
		}
		if !sameUUID(sys.UUID, systemUUID) {
			continue
		}
		if sys.Processors.ID == "" {
			return nil, nil
		}
		procs, err := r.members(ctx, sys.Processors.ID)
		if err != nil {
			return nil, err
		}
		var gpus []gpu
		for _, pp := range procs {
			var proc struct {
				ProcessorType, UUID, Model, Manufacturer string
				Status                                   struct{ State string }
			}
			if err := r.get(ctx, pp, &proc); err != nil {
				return nil, err
			}
			switch {
			case proc.ProcessorType != "GPU", proc.UUID == "":
			case proc.Status.State == "Absent", proc.Status.State == "Disabled", proc.Status.State == "UnavailableOffline":
			default:
				gpus = append(gpus, gpu{uuid: proc.UUID, productName: strings.TrimSpace(proc.Manufacturer + " " + proc.Model)})
			}
		}
		return gpus, nil
	}
	return nil, fmt.Errorf("no ComputerSystem with UUID %s", systemUUID)
}
