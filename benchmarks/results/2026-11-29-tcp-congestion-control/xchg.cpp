// exchange N bytes both ways per iteration over TCP: one connection for both directions (bi) or one per direction (uni)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <fcntl.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
static int BUF=0;static void sb(int s){if(BUF){setsockopt(s,SOL_SOCKET,SO_RCVBUF,&BUF,sizeof BUF);setsockopt(s,SOL_SOCKET,SO_SNDBUF,&BUF,sizeof BUF);}}
static int listen_on(int port){int l=socket(AF_INET,SOCK_STREAM,0);sb(l);int one=1;setsockopt(l,SOL_SOCKET,SO_REUSEADDR,&one,sizeof one);sockaddr_in a{};a.sin_family=AF_INET;a.sin_port=htons(port);bind(l,(sockaddr*)&a,sizeof a);listen(l,4);return l;}
static int dial(const char*h,int port){for(;;){int s=socket(AF_INET,SOCK_STREAM,0);sb(s);sockaddr_in a{};a.sin_family=AF_INET;a.sin_port=htons(port);inet_pton(AF_INET,h,&a.sin_addr);if(connect(s,(sockaddr*)&a,sizeof a)==0)return s;close(s);usleep(10000);}}
static void prep(int s){int one=1;setsockopt(s,IPPROTO_TCP,TCP_NODELAY,&one,sizeof one);fcntl(s,F_SETFL,O_NONBLOCK);}
int main(int argc,char**argv){bool uni=!strcmp(argv[1],"uni");bool srv=!strcmp(argv[2],"srv");const char*peer=argv[3];size_t n=atol(argv[4]);int it=atoi(argv[5]);bool qa=argc>6&&!strcmp(argv[6],"qa");if(getenv("BUF"))BUF=atoi(getenv("BUF"));bool spin=argc>6&&!strcmp(argv[6],"spin");auto QA=[&](int fd){if(qa){int one=1;setsockopt(fd,IPPROTO_TCP,TCP_QUICKACK,&one,sizeof one);}};
 int out,in;
 if(srv){int l=listen_on(29999);int a=accept(l,0,0);int b=uni?accept(l,0,0):a; if(uni){/*first accepted = client's send conn*/ in=a; out=dial(peer,29998);} else {in=out=a;} (void)b;}
 else{ if(uni){int l=listen_on(29998); out=dial(peer,29999); int a2=dial(peer,29999); close(a2); in=accept(l,0,0);} else {in=out=dial(peer,29999);} }
 // note: in uni mode the server accepted two conns; the second (closed) is ignored
 prep(in); if(out!=in) prep(out);
 std::vector<char> sb(n,1),rb(n);std::vector<double> t(it);
 for(int i=-20;i<it;i++){auto a=std::chrono::steady_clock::now();size_t s=0,r=0;
  while(s<n||r<n){ if(s<n){ssize_t w=send(out,sb.data()+s,n-s,MSG_DONTWAIT|MSG_NOSIGNAL);if(w>0){s+=w;QA(out);}} if(r<n){ssize_t g=recv(in,rb.data()+r,n-r,MSG_DONTWAIT);if(g>0){r+=g;QA(in);}else if(g==0){puts("closed");return 1;}}
   if(!spin&&(s<n||r<n)){pollfd f[2];int k=0;if(r<n)f[k++]={in,POLLIN,0};if(s<n)f[k++]={out,POLLOUT,0};if(out==in&&k==2){f[0].events|=POLLOUT;k=1;}poll(f,k,1);} }
  if(i>=0)t[i]=std::chrono::duration<double,std::micro>(std::chrono::steady_clock::now()-a).count();}
 double tot=0;for(double x:t)tot+=x;std::vector<double> s=t;std::sort(s.begin(),s.end());
 printf("%s %s: %d x %zu B: total %.1f ms median %.0f us max %.0f; >2ms:",argv[1],argv[2],it,n,tot/1000,s[it/2],s.back());for(int i=0;i<it;i++)if(t[i]>2000)printf(" %.1f",t[i]/1000);puts("");}
