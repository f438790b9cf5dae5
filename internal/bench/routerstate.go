package bench

import (
	"fmt"
	"reflect"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/prefix"
	"github.com/kvgate/kvgate/internal/route"
)

// routerState returns a router's fleet and prefix index, which route does not
// export, so that replicas in virtual time can share state through the calls
// the live system will use (fleet.Fleet's SetPeerLoad and Loads,
// prefix.Index's Record). It is a stand-in until route offers those calls
// itself; it fails, rather than guess, if the fields change.
func routerState(r *route.Router) (*fleet.Fleet, *prefix.Index, error) {
	v := reflect.ValueOf(r).Elem()
	f, err := unexported[*fleet.Fleet](v, "fleet")
	if err != nil {
		return nil, nil, err
	}
	x, err := unexported[*prefix.Index](v, "prefix")
	if err != nil {
		return nil, nil, err
	}
	return f, x, nil
}

// unexported reads the unexported field name of the struct v, of type T.
func unexported[T any](v reflect.Value, name string) (T, error) {
	var zero T
	fv := v.FieldByName(name)
	if !fv.IsValid() || fv.Type() != reflect.TypeFor[T]() {
		return zero, fmt.Errorf("route.Router has no field %s of type %v: replicas cannot share its state", name, reflect.TypeFor[T]())
	}
	got, ok := reflect.NewAt(fv.Type(), fv.Addr().UnsafePointer()).Elem().Interface().(T)
	if !ok {
		return zero, fmt.Errorf("route.Router's field %s is not a %v", name, reflect.TypeFor[T]())
	}
	return got, nil
}
