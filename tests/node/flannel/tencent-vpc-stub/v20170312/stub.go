// Package v20170312 stands in for Tencent Cloud's VPC client, which the Go module proxy refuses.
// flannel links it for its tencent-vpc backend only; the test node uses the vxlan backend, and
// every call here fails, so a configuration that selects tencent-vpc says so instead of routing.
package v20170312

import "errors"

var errStub = errors.New("tencent-vpc backend not built into this flannel (nodeward test stub)")

type Client struct{}

func NewClientWithSecretId(secretID, secretKey, region string) (*Client, error) {
	return nil, errStub
}

type Filter struct {
	Name   *string
	Values []*string
}

type Route struct {
	DestinationCidrBlock *string
	GatewayType          *string
	GatewayId            *string
	RouteId              *uint64
	RouteType            *string
	Enabled              *bool
}

type RouteTable struct {
	RouteTableId *string
	RouteSet     []*Route
}

type DescribeRouteTablesRequest struct{ Filters []*Filter }

type DescribeRouteTablesResponse struct {
	Response *struct{ RouteTableSet []*RouteTable }
}

type DeleteRoutesRequest struct {
	RouteTableId *string
	Routes       []*Route
}

type CreateRoutesRequest struct {
	RouteTableId *string
	Routes       []*Route
}

func NewDescribeRouteTablesRequest() *DescribeRouteTablesRequest {
	return &DescribeRouteTablesRequest{}
}
func NewDeleteRoutesRequest() *DeleteRoutesRequest { return &DeleteRoutesRequest{} }
func NewCreateRoutesRequest() *CreateRoutesRequest { return &CreateRoutesRequest{} }

func (c *Client) DescribeRouteTables(*DescribeRouteTablesRequest) (*DescribeRouteTablesResponse, error) {
	return nil, errStub
}
func (c *Client) DeleteRoutes(*DeleteRoutesRequest) (struct{}, error) { return struct{}{}, errStub }
func (c *Client) CreateRoutes(*CreateRoutesRequest) (struct{}, error) { return struct{}{}, errStub }
